"""Ahead-of-time compilation of Triton (and Gluon) kernels for a Hopper target, with no GPU present.

Each Triton backend package may have ``aot.py`` with ``aot_targets() -> list[dict]``; a target is
``{"name", "kernel" (a @triton.jit function), "signature" ({arg: "*fp32" | "i32" | ... |
"constexpr"}), "constexprs" ({name: value}), "options" (optional: num_warps, num_stages), "aligned" (optional:
arguments the JIT would find divisible by 16, pointers or integers; this is what vectorizes)}``.
Compiling them for sm_90 catches what only the GPU compiler sees (layouts, dot shapes, shared
memory, ptxas) on a CPU-only CI machine. ``python -m harness.tools.triton_aot`` compiles them all.

``--fingerprints FILE`` also writes each target's code fingerprint (a hash of its PTX without line or
debug information, and its shared memory); ``--compare FILE`` lists the targets whose code differs from
such a file (exit 1 if any). A refactor meant to leave the generated code alone (a helper extracted, lines
moved) can so be shown to do that without a GPU, and without rerunning GPU evidence.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# opt-in shared memory per block on sm_90 (H100/H200): 227 KB; a launch asking more fails
MAX_SHARED = {90: 232448}


def rowwise_target(name: str, fn: object, dtype: str, constexprs: dict, warps: int, data: set[str],
                   unit: tuple[str, ...], aligned: set[str], floats: tuple[str, ...] = ("eps",)) -> dict:
    """A target of a row-wise kernel whose tensors are named ``*_ptr``: the pointers in ``data`` carry the
    case dtype (``bf16``, ``fp16``, ``fp32``) and the others float32; the strides in ``unit`` are
    specialized to 1 (contiguous innermost), the integers in ``aligned`` and every pointer marked divisible
    by 16, as the JIT finds them for contiguous tensors at production sizes."""
    names = fn.arg_names  # type: ignore[attr-defined]
    constexprs = {a: 1 for a in unit if a in names} | constexprs
    sig = {a: "constexpr" if a in constexprs else (f"*{dtype}" if a in data else "*fp32") if a.endswith("_ptr")
           else "fp32" if a in floats else "i32" for a in names}
    marked = [a for a in names if a not in constexprs and (a.endswith("_ptr") or a in aligned)]
    return {"name": name, "kernel": fn, "signature": sig, "constexprs": constexprs,
            "options": {"num_warps": warps}, "aligned": marked}


def compile_target(target: dict, arch: int = 90) -> object:
    """Compile one target for ``cuda:<arch>`` (warp size 32); returns Triton's compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = target["kernel"]
    if not hasattr(fn, "arg_names"):
        raise TypeError(f"target {target.get('name')!r}: kernel {fn!r} is not a @triton.jit function "
                        "(is TRITON_INTERPRET set? AOT compilation needs it unset)")
    consts = dict(target.get("constexprs") or {})
    # Triton renamed ASTSource's `constants` to `constexprs`; accept either release
    params = inspect.signature(ASTSource.__init__).parameters
    key = "constexprs" if "constexprs" in params else "constants"
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in target.get("aligned", ())}
    if getattr(fn, "is_gluon", lambda: False)():
        # Gluon kernels (explicit layouts) lower through their own source class
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn, dict(target["signature"]), consts, attrs)
    else:
        src = ASTSource(fn=fn, signature=dict(target["signature"]), attrs=attrs or None, **{key: consts})
    options = dict(target.get("options") or {})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options or None)


def as_descriptors(target: dict, blocks: dict[str, tuple[str, tuple[int, ...]]]) -> dict:
    """Marks arguments of ``target`` as TMA tensor descriptors, ``{argument: (element type such as "bf16",
    block shape)}``, as a launch with ``triton.tools.tensor_descriptor.TensorDescriptor`` arguments
    specializes them. A descriptor is not a pointer: it leaves the divisibility hints ("aligned")."""
    for arg, (ty, block) in blocks.items():
        target["signature"][arg] = f"tensordesc<{ty}[{', '.join(str(b) for b in block)}]>"
    target["aligned"] = tuple(a for a in target.get("aligned", ()) if a not in blocks)
    return target


def resource_problem(kernel: object, arch: int = 90) -> str | None:
    """Why a compiled kernel would fail to launch on ``arch`` (shared memory), or None."""
    shared = getattr(getattr(kernel, "metadata", None), "shared", 0) or 0
    limit = MAX_SHARED.get(arch)
    if limit is not None and shared > limit:
        return f"needs {shared} bytes of shared memory, sm_{arch} allows {limit} per block"
    return None


def code_fingerprint(kernel: object) -> dict:
    """What a compiled kernel runs, independent of where its source lines sit: a hash of its PTX without
    the .loc/.file line records, the $L__tmp labels that mark inlined scopes for the debugger, and the
    debug sections (they carry line numbers), and its shared memory."""
    lines = []
    for line in kernel.asm["ptx"].splitlines():
        s = line.strip()
        if s.startswith(".section"):  # the debug sections close the file
            break
        if not s.startswith((".loc", ".file", "//", "$L__tmp")):
            lines.append(line)
    return {"ptx_sha1": hashlib.sha1("\n".join(lines).encode()).hexdigest()[:16],
            "shared": getattr(kernel.metadata, "shared", None)}


def discover_targets() -> list[tuple[str, dict]]:
    """(backend package, target) for every ``backends/<impl>/<operator>/aot.py`` of the repository."""
    backends = importlib.import_module("harness.backends")  # the in-tree backends, wherever installed

    root = Path(next(iter(backends.__path__)))
    out: list[tuple[str, dict]] = []
    for path in sorted(root.glob("*/*/aot.py")):
        package = "harness.backends." + ".".join(path.relative_to(root).parent.parts)
        mod = importlib.import_module(package + ".aot")
        out += [(package, t) for t in mod.aot_targets()]
    return out


def main(argv: list[str] | None = None) -> int:
    """Compile every discovered target (or those whose id contains a FILTER); print one JSON line per
    target; exit 1 if any failed, or if --compare finds code that differs."""
    ap = argparse.ArgumentParser(prog="python -m harness.tools.triton_aot")
    ap.add_argument("filters", nargs="*", metavar="FILTER", help="substrings of the target ids to compile")
    ap.add_argument("--fingerprints", metavar="FILE", help="write {id: code fingerprint} as JSON")
    ap.add_argument("--compare", metavar="FILE", help="a --fingerprints file to compare the code with")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    before = json.loads(Path(args.compare).read_text()) if args.compare else None
    failed, prints, changed = 0, {}, []
    for package, target in discover_targets():
        tid = f"{package}:{target['name']}"
        if args.filters and not any(a in tid for a in args.filters):
            continue
        t0 = time.perf_counter()
        row = {"id": tid}
        try:
            kernel = compile_target(target)
            err = resource_problem(kernel)
            prints[tid] = code_fingerprint(kernel)
            if before is not None:
                row["code"] = ("new" if tid not in before else
                               "same" if before[tid] == prints[tid] else "changed")
                changed += [tid] if row["code"] != "same" else []
        except Exception as e:  # report every failing kernel, not only the first
            err = f"{type(e).__name__}: {e}"
        failed += err is not None
        row |= {"seconds": round(time.perf_counter() - t0, 2), "error": err}
        print(json.dumps(row), flush=True)
    if args.fingerprints:
        Path(args.fingerprints).write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n")
    if before is not None:
        print(f"code compared with {args.compare}: {len(prints) - len(changed)} same, {len(changed)} changed or new"
              + (": " + ", ".join(changed) if changed else ""), file=sys.stderr)
    return 1 if failed or changed else 0


if __name__ == "__main__":
    sys.exit(main())
