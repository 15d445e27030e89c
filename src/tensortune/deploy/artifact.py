"""A tuned model as one file to ship: ``compile --out`` writes it, ``tensortune.load`` calls it.

The file is a zip holding ``manifest.json`` (what built it, for which CPU, the inputs it takes)
and ``model.so`` (TVM's exported Relax executable, weights included).  Everything in the
manifest is checked before the library is opened: a shared library runs code as it loads, so
an artifact of another format version, another TVM, another architecture or a CPU lacking an
instruction set the code was compiled for is refused with one line, and never loaded.
"""

from __future__ import annotations

import json
import lzma
import os
import platform as host
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tensortune.deploy.host_call import HostCall
from tensortune.errors import TensortuneError, last_line
from tensortune.files import replaced_whole
from tensortune.hardware.target import cpu_isa, target_isa

if TYPE_CHECKING:
    from tensortune.workloads.models import Model

FORMAT = "tensortune-artifact"
VERSION = 1
_MANIFEST, _LIBRARY = "manifest.json", "model.so"
# A manifest is a few hundred bytes; a zip member's stated size is checked before inflating it.
MANIFEST_BYTES = 1 << 20


class ArtifactError(TensortuneError):
    """An artifact that is not one, is damaged, or was built for something else."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str


def save_artifact(executable: Any, path: str | os.PathLike, *, model: Model, target: dict,
                  threads: int, extra: dict | None = None,
                  library: str | os.PathLike | None = None) -> Path:  # fmt: skip
    """Write ``executable`` (``model``'s module, built) and its manifest to ``path``;
    ``library``: ``executable`` already exported there, not exported again."""
    from importlib.metadata import version

    from tensortune.compat import tvm

    path = Path(path)
    inputs = model.inputs
    # A one-output model returns its array itself, not a one-element list
    single_output = not isinstance(model.mod["main"].ret_ty, tvm.ir.TupleType)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "tensortune": version("tensortune"),
        "tvm": tvm.__version__,
        "model": model.name,
        "target": target,
        "arch": host.machine(),
        "cpu_features": sorted(target_isa(target)),
        "threads": threads,
        "inputs": [{"shape": list(x.shape), "dtype": str(x.dtype)} for x in inputs],
        "single_output": single_output,
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if library is None:
            library = Path(tmp) / _LIBRARY
            executable.export_library(str(library))
        with (
            replaced_whole(path) as partial,
            zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z,
        ):
            z.writestr(_MANIFEST, json.dumps(manifest, indent=2))
            z.write(Path(library), _LIBRARY)
    return path


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the artifact at ``path``, checked to be one this version can load here;
    ``ArtifactError`` otherwise.  Opens no library."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if _MANIFEST not in names or _LIBRARY not in names:
                raise ArtifactError(f"{path}: not a tensortune artifact (no {_MANIFEST})")
            if z.getinfo(_MANIFEST).file_size > MANIFEST_BYTES:  # inflated before it is read
                raise ArtifactError(f"{path}: damaged manifest (over {MANIFEST_BYTES} bytes)")
            manifest = json.loads(z.read(_MANIFEST))
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ArtifactError(f"{path}: is a directory, not an artifact file") from None
    except zipfile.BadZipFile:
        raise ArtifactError(f"{path}: not a tensortune artifact (not a zip file)") from None
    # Not UTF-8, not JSON, nested too deep, an integer past Python's 4,300 digits.
    except (ValueError, RecursionError) as e:
        raise ArtifactError(f"{path}: damaged manifest ({type(e).__name__})") from None
    except _UNREADABLE_MEMBER as e:
        raise ArtifactError(f"{path}: cannot be read ({e})") from None
    _check(path, manifest)
    return manifest


# A zip member that cannot be read: truncated or damaged (zlib, LZMA), no access; encrypted
# (RuntimeError), or in a compression zipfile does not read (NotImplementedError).
_UNREADABLE_MEMBER = (zlib.error, lzma.LZMAError, EOFError, OSError, RuntimeError,
                      NotImplementedError)  # fmt: skip


def _check(path: Path, m: object) -> None:
    from tensortune.compat import tvm

    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a tensortune artifact")
    version = m.get("version")
    if type(version) is not int or version < 1:
        raise ArtifactError(f"{path}: damaged manifest (version)")
    if version > VERSION:
        raise ArtifactError(f"{path}: artifact format {version!r} is newer than this "
                            f"tensortune reads ({VERSION}): upgrade tensortune")  # fmt: skip
    if m.get("tvm") != tvm.__version__:
        raise ArtifactError(f"{path}: built with TVM {m.get('tvm')}, this is TVM "
                            f"{tvm.__version__}: compile it again here")  # fmt: skip
    if m.get("arch") != host.machine():
        raise ArtifactError(f"{path}: built for {m.get('arch')}, this machine is "
                            f"{host.machine()}")  # fmt: skip
    features = m.get("cpu_features")
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise ArtifactError(f"{path}: damaged manifest (cpu_features)")
    missing = sorted((set(features) | _target_isa(path, m.get("target"))) - cpu_isa())
    if missing:
        raise ArtifactError(f"{path}: built for a CPU with {', '.join(missing)}, which this "
                            f"CPU lacks: compile it for this CPU")  # fmt: skip
    inputs, threads = m.get("inputs"), m.get("threads")
    if not (isinstance(inputs, list) and all(_spec_ok(x) for x in inputs)):
        raise ArtifactError(f"{path}: damaged manifest (inputs)")
    if type(threads) is not int or threads < 1:
        raise ArtifactError(f"{path}: damaged manifest (threads)")
    if type(m.get("single_output", True)) is not bool:
        raise ArtifactError(f"{path}: damaged manifest (single_output)")


def _target_isa(path: Path, target: object) -> set[str]:
    """The instruction sets the manifest's target lets its code use, judged by today's list
    (``ISA``): an artifact written when the list was shorter (before VBMI, GFNI and the like
    were on it) names fewer in ``cpu_features`` than its code may hold."""
    if not isinstance(target, dict):
        raise ArtifactError(f"{path}: damaged manifest (target)")
    try:
        return target_isa(target)
    except Exception:  # TVM refuses a target it cannot parse, in errors of its own types
        raise ArtifactError(f"{path}: damaged manifest (target)") from None


def _spec_ok(x: object) -> bool:
    """An input's entry: ``{"shape": [non-negative ints], "dtype": a NumPy dtype name}``."""
    if not isinstance(x, dict) or not isinstance(x.get("shape"), list):
        return False
    if not all(type(d) is int and d >= 0 for d in x["shape"]):
        return False
    try:
        return isinstance(x.get("dtype"), str) and str(np.dtype(x["dtype"])) == x["dtype"]
    except (TypeError, ValueError):  # not a dtype's name; a malformed record dtype ("f4,%")
        return False


class CompiledModel:
    """A loaded artifact: call it with NumPy arrays or PyTorch tensors, get the same back.

    TVM's thread pool is one per process and sized when first used: ``load`` sets
    ``TVM_NUM_THREADS`` to the threads the model was tuned for, capped at this machine's usable
    cores, unless it is set already.
    Calls from several threads take turns (``HostCall``).
    """

    def __init__(self, manifest: dict, vm: Any) -> None:
        self.manifest = manifest
        self.inputs = [TensorSpec(tuple(x["shape"]), x["dtype"]) for x in manifest["inputs"]]
        self._vm = vm
        self._call = HostCall(vm, [x.shape for x in self.inputs], [x.dtype for x in self.inputs])

    @property
    def name(self) -> str:
        return str(self.manifest.get("model", ""))

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.inputs):
            raise TensortuneError(f"{self.name} takes {len(self.inputs)} input(s), "
                                  f"got {len(args)}")  # fmt: skip
        torch_in = any(type(a).__module__.startswith("torch") for a in args)
        pairs = enumerate(zip(args, self.inputs, strict=True))
        arrays = [_as_array(a, spec, i) for i, (a, spec) in pairs]
        try:
            outs = self._call(arrays)
        except (RuntimeError, ValueError) as e:  # TVM's errors, its input checks' included
            # The manifest's inputs are checked at load by count only (the library does not
            # say its shapes): a manifest edited to other shapes or dtypes fails here.
            raise ArtifactError(f"{self.name}: the compiled model failed ({last_line(e)}; "
                                "a manifest whose inputs the library does not take fails "
                                "so)") from None  # fmt: skip
        if torch_in:
            import torch

            outs = [torch.from_numpy(o) for o in outs]
        return outs[0] if self.manifest.get("single_output", True) else tuple(outs)


def _as_array(value: Any, spec: TensorSpec, index: int) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        try:
            value = value.detach().cpu().numpy()
        except TypeError:  # a dtype NumPy has no type for (bfloat16): not this model's input
            raise _wrong_input(value, spec, index) from None
    a = np.asarray(value, order="C")  # ascontiguousarray would make a scalar 1-d
    if a.shape != spec.shape or str(a.dtype) != spec.dtype:
        raise _wrong_input(a, spec, index)
    return a


def _wrong_input(value: Any, spec: TensorSpec, index: int) -> TensortuneError:
    return TensortuneError(f"input {index}: expected {spec.dtype}{list(spec.shape)}, "
                           f"got {value.dtype}{list(value.shape)}")  # fmt: skip


def load(path: str | os.PathLike) -> CompiledModel:
    """Load an artifact written by ``tensortune compile MODEL --out FILE``
    (``compile_model(..., out=FILE)``) as a callable; ``ArtifactError`` for a file that is not
    one, or that was built for another TVM, architecture or CPU."""
    from tensortune.hardware import usable_cores

    manifest = read_manifest(path)
    # The build machine's cores, but no more threads than this machine lets the process use:
    # more would spin on each other (and a hostile manifest could ask for a million).
    os.environ.setdefault("TVM_NUM_THREADS", str(min(manifest["threads"], usable_cores())))
    from tensortune.compat import tvm

    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(path) as z:
        try:  # the manifest read fine; the library's bytes may still be damaged
            lib_path = z.extract(_LIBRARY, tmp)
        except (zipfile.BadZipFile, *_UNREADABLE_MEMBER) as e:
            raise ArtifactError(f"{path}: damaged library ({e})") from None
        try:
            lib = tvm.runtime.load_module(lib_path)
            vm = tvm.relax.VirtualMachine(lib, tvm.cpu())
            arity = int(vm._get_function_arity("main"))
        except Exception as e:
            raise ArtifactError(f"{path}: its library does not load: {last_line(e)}") from None
    if arity != len(manifest["inputs"]):
        raise ArtifactError(f"{path}: damaged manifest (its model takes {arity} inputs, the "
                            f"manifest lists {len(manifest['inputs'])})")  # fmt: skip
    # The library stays mapped once opened: the temporary copy can go.
    return CompiledModel(manifest, vm)
