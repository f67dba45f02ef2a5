"""The ``detection:`` section of the config file.

```yaml
detection:
  warmup_s: 900   # stored history replayed to the detectors at hub start and at shard takeover
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: the default warm-up window: long enough for step-time, loss and liveness baselines to form
WARMUP_S = 900.0
#: how long the detectors and the productivity model keep a job's state after it ended or failed
#: (an hour: past every alert hold; its GPU time and events stay in the store's rollups)
FINISHED_JOB_RETENTION_S = 3600.0
#: how often that state is swept for jobs past the retention
JOB_SWEEP_S = 60.0


class DetectionConfigError(ValueError):
    """A bad ``detection:`` value; the message names the key."""


@dataclass(frozen=True, slots=True)
class DetectionSettings:
    warmup_s: float = WARMUP_S


def parse_detection(section: dict[str, Any]) -> DetectionSettings:
    value = section.get("warmup_s", WARMUP_S)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise DetectionConfigError("detection.warmup_s: must be a non-negative number")
    return DetectionSettings(float(value))
