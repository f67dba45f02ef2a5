"""An alert as every store keeps it: one JSON document per alert id, written many at a time."""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from gpuscope.model import Alert


def alert_doc(alert: Alert) -> str:
    """The stored document of an alert (``Alert(**orjson.loads(doc))`` reads it back)."""
    return orjson.dumps(
        alert.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str
    ).decode()


def latest(alerts: Iterable[Alert]) -> list[Alert]:
    """Each alert once, as listed last: one multi-row upsert may not write a row twice."""
    return list({alert.id: alert for alert in alerts}.values())
