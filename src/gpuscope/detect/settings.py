"""The ``detection:`` section of the config file.

```yaml
detection:
  warmup_s: 900   # stored history replayed to the detectors at hub start and at shard takeover
  finished_job_retention_s: 3600   # a job's state is forgotten this long after it ended
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
    finished_job_retention_s: float = FINISHED_JOB_RETENTION_S


def _seconds(section: dict[str, Any], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise DetectionConfigError(f"detection.{key}: must be a non-negative number")
    return float(value)


def parse_detection(section: dict[str, Any]) -> DetectionSettings:
    return DetectionSettings(
        _seconds(section, "warmup_s", WARMUP_S),
        _seconds(section, "finished_job_retention_s", FINISHED_JOB_RETENTION_S),
    )
