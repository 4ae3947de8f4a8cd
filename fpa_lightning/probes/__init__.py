"""The probe suite (docs/probes.md): the paper's synthetic probes, a bounded-capacity probe model built from the
project's attention layer, seed ensembles and the training of one row, the exact sign test, and the hand-built heads
of the theory. The paper's table (its groups, the runner that trains them, the report) is an application of this
package: ``modules/probes``."""
from fpa_lightning.probes.base import IGNORE, Probe, ProbeBatch
from fpa_lightning.probes.dips import DipDepth
from fpa_lightning.probes.ladder import DipDuration, Ladder, MultiDipLadder, UnnamedLadder
from fpa_lightning.probes.names import FindName, FindNameByPlace, VarAssign
from fpa_lightning.probes.recall import Mqar
from fpa_lightning.probes.sequences import Copy, Counting, FlipFlop
from fpa_lightning.probes.walks import PushPop, TwoFamilies

PROBES: dict[str, type[Probe]] = {
    cls.name: cls
    for cls in (Ladder, UnnamedLadder, MultiDipLadder, DipDuration, DipDepth, TwoFamilies, PushPop, FindName,
                FindNameByPlace, FlipFlop, Copy, Counting, VarAssign, Mqar)
}

__all__ = ["IGNORE", "PROBES", "Probe", "ProbeBatch"]
