"""eval.py with every timed() call logged to stderr (the calibration's passes and cache_prune's real-eviction
documents): usage python timed_eval.py EVAL_ARGS..."""
import runpy, sys, torch
import modules.evaluation.progress as P
import modules.evaluation.tasks.cache_prune as C
orig = P.timed
def logged(device, fn, *args):
    r, s = orig(device, fn, *args)
    ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
    print(f"TIMED {getattr(fn, '__name__', fn)} {None if ids is None else tuple(ids.shape)} {s:.3f}", file=sys.stderr)
    return r, s
P.timed = logged; C.timed = logged
sys.argv = ["eval.py"] + sys.argv[1:]
runpy.run_path("eval.py", run_name="__main__")
