"""Silences (persisted, with expiry) and recurring maintenance windows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpuscope.alert.labels import parse_matcher
from gpuscope.alert.maintenance import parse_window
from gpuscope.alert.silences import Silences, new_silence, parse_config_silences
from gpuscope.alert.statedb import StateDB


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_a_silence_mutes_matching_labels_until_it_expires_and_survives_a_restart(tmp_path: Path) -> None:
    db = StateDB(str(tmp_path / "s.sqlite"))
    silences = Silences(db)
    s = silences.add(new_silence([parse_matcher("node=node-3")], 1000.0, duration=600, comment="swap PSU"))
    assert silences.muting({"node": "node-3", "rule": "gpu_lost"}, 1000.0) is s
    assert silences.muting({"node": "node-2"}, 1000.0) is None
    assert silences.muting({"node": "node-3"}, 1600.0) is None  # expired
    db.close()
    again = Silences(StateDB(str(tmp_path / "s.sqlite")))
    assert [x.id for x in again.list(1000.0)] == [s.id] and again.muting({"node": "node-3"}, 1200.0)
    again.expire(s.id, 1300.0)
    assert again.muting({"node": "node-3"}, 1300.0) is None and again.list(1300.0) == []
    assert [x.id for x in again.list(1300.0, include_expired=True)] == [s.id]


def test_silences_refuse_to_mute_everything_or_nothing() -> None:
    with pytest.raises(ValueError, match="at least one matcher"):
        new_silence([], 0.0, duration=60)
    with pytest.raises(ValueError, match="positive duration"):
        new_silence([parse_matcher("a=b")], 0.0, duration=0)
    (cfg,) = parse_config_silences([{"matchers": ["job=exp"], "duration": "2h", "comment": "known"}], 100.0)
    assert cfg.id == "sil-config-0" and cfg.ends_at == 100.0 + 7200 and cfg.created_by == "config"


def test_a_weekly_window_is_open_on_its_days_and_hours_in_its_time_zone() -> None:
    w = parse_window(
        {
            "name": "sat-night",
            "matchers": {"node": "node-3"},
            "weekdays": ["saturday"],
            "start": "23:00",
            "duration": "3h",
            "timezone": "Europe/Berlin",
        },
        "w",
    )
    # 2026-03-07 is a Saturday; Berlin is UTC+1 then.
    assert not w.open_at(ts("2026-03-07T21:59:00+00:00"))
    assert w.open_at(ts("2026-03-07T22:00:00+00:00"))
    assert w.open_at(ts("2026-03-08T00:30:00+00:00"))  # past midnight, still open
    assert not w.open_at(ts("2026-03-08T01:00:00+00:00"))
    assert not w.open_at(ts("2026-03-14T21:30:00+00:00"))  # the next Saturday, before 23:00 local
    assert w.mutes({"node": "node-3"}, ts("2026-03-07T23:00:00+00:00"))
    assert not w.mutes({"node": "node-1"}, ts("2026-03-07T23:00:00+00:00"))


def test_a_daily_and_a_one_off_window() -> None:
    daily = parse_window({"matchers": ["owner=platform"], "start": "02:00", "duration": "30m"}, "d")
    assert daily.open_at(ts("2026-05-05T02:10:00+00:00")) and not daily.open_at(
        ts("2026-05-05T02:31:00+00:00")
    )
    once = parse_window({"matchers": ["job=x"], "starts_at": 100, "ends_at": 200}, "o")
    assert once.open_at(150) and not once.open_at(200)
    with pytest.raises(ValueError, match="ends_at must be after"):
        parse_window({"matchers": ["job=x"], "starts_at": 200, "ends_at": 100}, "o")
