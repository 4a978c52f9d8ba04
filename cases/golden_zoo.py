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
    expect=(Expectation(Case("zoo-n4-D40", {"B": 1, "S": 8, "n": 4, "D": 40}), "float32", hint="shape",
                        fail=("dgamma",), status="SHAPE",
                        passing=("dx", "dphi.pre", "dphi.post", "dphi.res", "dalpha.pre", "dbias.pre", "h_in")),),
))

# The classic microbatch mistake on the eager torch fused_linear_xent backend (runs on any machine):
# each microbatch divides by its own valid-token count instead of the global normalizer.
register_mutant(Mutant(
    id="xent-microbatch-mean-torch",
    operator="fused_linear_xent",
    backend="torch",
    seed="fused xent log",
    description="per-microbatch mean instead of the global normalizer",
    edits=(("fused_linear_xent.py", 'out = {"loss": xent_loss(z, targets, **options)}',
            'out = {"loss": xent_loss(z, targets, **{**options, "normalizer": None})}'),),
    expect=(Expectation(Case("zoo-N24-H16-V67-mb2", {"N": 24, "H": 16, "V": 67}, ("microbatch",), 2), "float32",
                        hint="microbatch-mean",
                        fail=("loss", "dhidden", "dweight", "dbias"), status="FAIL",
                        where={"dhidden": {"token": "all"}}),),
))
