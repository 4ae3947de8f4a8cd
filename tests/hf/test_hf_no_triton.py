"""Without triton (torch's CPU wheel does not bring it): an export loads with trust_remote_code=True and runs its
forward and generate on the CPU, and so does the package; a fused op asked for raises a clear error instead of
running another path. Each check runs in a fresh interpreter where an import hook makes `import triton` fail."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import transformers  # noqa: E402,F401  declared in the dev extra: a broken install fails here rather than skips
import fpa_lightning  # noqa: E402
from fpa_lightning import Decoder, ModelConfig  # noqa: E402
from fpa_lightning.generation import generate  # noqa: E402
from fpa_lightning.hf.save_export import save_export  # noqa: E402

# as a CPU-only install: importing triton (or any triton.*) fails as for a package that is not there
NO_TRITON = """
import sys
class _NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTriton())
sys.modules.pop("triton", None)
"""
REMOTE = NO_TRITON + """
for name in ("fpa_lightning", "datamodules", "modules", "callbacks", "eval", "train"):
    sys.modules[name] = None  # the folder's own code, not the installed package
import torch
from transformers import AutoModelForCausalLM
folder, inputs, output = sys.argv[1:]
ids = torch.load(inputs)
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(ids).logits
greedy = model.generate(ids, max_new_tokens=6, do_sample=False, prune_threshold=-1.0)
torch.save({"logits": logits, "greedy": greedy, "module": type(model).__module__,
            "triton": sorted(k for k in sys.modules if k.split(".")[0] == "triton")}, output)
"""
PACKAGE = NO_TRITON + """
import os
os.environ["TRITON_INTERPRET"] = "1"  # so that the CPU passes the fused ops' device check and reaches the kernels
import torch
import fpa_lightning.hf  # the transformers classes, the model, generation: all without triton
from fpa_lightning import Decoder, ModelConfig
from fpa_lightning.generation.session import DecodeSession
from fpa_lightning.ops.fpa import fpa_attention
from fpa_lightning.ops.decode.fused import unsupported_reason
q = torch.randn(1, 16, 2, 16)
field = torch.zeros(1, 16, 2)
try:
    fpa_attention(q, q, q, field, field, torch.ones(2))
except RuntimeError as err:
    print("fused op:", err)
cfg = ModelConfig(vocab_size=64, n_layer=1, d_model=32, n_head=2, d_mlp=64, max_seq_len=32,
                  attention={"backend": "fpa", "impl": "chunked"})
decoder = Decoder(cfg).eval()
print("decoding:", DecodeSession(decoder).attention_impl_used)
print("on a GPU:", unsupported_reason(torch.device("cuda"), 64, torch.bfloat16))  # so auto decodes with the reference
try:
    DecodeSession(decoder, attention_impl="fused")
except ValueError as err:
    print("fused session:", err)
print("triton modules:", sorted(k for k in sys.modules if k.split(".")[0] == "triton"))
"""


def fresh_python(script: str, *args, cwd, path: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "PYTHONPATH": path, "HF_MODULES_CACHE": str(cwd / "m"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("backend", ["dcp", "fpa"])  # dcp: the module the missing triton was first reported from
def test_an_export_loads_and_generates_without_triton(tmp_path, tokenizer, backend):
    torch.manual_seed(0)
    decoder = Decoder(ModelConfig(vocab_size=32000, n_layer=2, d_model=32, n_head=2, d_mlp=64, max_seq_len=64,
                                  attention={"backend": backend, "impl": "chunked", "block_size": 16})).eval()
    save_export(decoder, str(tmp_path / "export"), "# card\n", tokenizer, 1, 2)
    ids = torch.randint(3, 32000, (1, 12), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    run = fresh_python(REMOTE, tmp_path / "export", tmp_path / "ids.pt", tmp_path / "out.pt", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    assert out["module"].startswith("transformers_modules.") and out["triton"] == []
    with torch.no_grad():
        assert torch.equal(out["logits"], decoder(ids))
    assert torch.equal(out["greedy"], generate(decoder, ids, 6, prune_threshold=-1.0))


def test_the_package_runs_without_triton_and_a_fused_request_says_what_is_missing(tmp_path):
    run = fresh_python(PACKAGE, cwd=tmp_path, path=str(pathlib.Path(fpa_lightning.__file__).parents[1]))  # this one
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert lines["fused op"].startswith("fpa_attention: the fused path runs Triton kernels, and triton is not "
                                        "installed (torch's CPU wheel does not bring it): pip install triton")
    assert lines["decoding"] == "naive"
    assert lines["on a GPU"].startswith("triton is not installed")  # auto picks the reference there too
    assert lines["fused session"].startswith("attention_impl='fused' cannot run here: triton is not installed")
    assert lines["triton modules"] == "[]"
