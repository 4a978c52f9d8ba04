"""Bug-zoo mutants of the golden mhc_pre backend (the seed's dgamma returned as [n, D])."""

from harness import Case, Expectation, Mutant, register_mutant

register_mutant(Mutant(
    id="mhc-dgamma-shape-golden",
    operator="mhc_pre",
    backend="golden",
    seed="mhc log, issue 6",
    description="dgamma returned as [n, D] instead of [n*D]",
    edits=(("mhc_pre.py", '"gamma": dgamma if s["has_gamma"] else None}',
            '"gamma": dgamma.view(n, D) if s["has_gamma"] else None}'),),
    expect=(Expectation(Case("zoo-n4-D40", {"B": 1, "S": 8, "n": 4, "D": 40}), "float32",
                        fail=("dgamma",), status="SHAPE",
                        passing=("dx", "dphi.pre", "dphi.post", "dphi.res", "dalpha.pre", "dbias.pre", "h_in")),),
))
