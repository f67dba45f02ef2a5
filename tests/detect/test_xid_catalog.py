"""XID classes from NVIDIA's XID catalog (immediate action; FATAL or not).

Source: docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, in NVIDIA's machine-readable
copy NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv
at 6f8b0fcfa8e502bdda78fabf96facef729a9285b. XID 154's message format as the driver prints it:
"NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)".
"""

from __future__ import annotations

import pytest

from gpuscope.detect.xid import XidDetector, recovery_action
from gpuscope.model import Event
from gpuscope.signals import APP_XIDS, FATAL_XIDS, XID_ACTION, XID_ACTIONS


def findings(code: int, message: str = "") -> list[tuple[str, dict[str, object]]]:
    det = XidDetector()
    data: dict[str, object] = {"code": code}
    if message:
        data["message"] = message
    det.on_event(Event(10.0, "xid", {"node": "n1", "gpu": "5"}, data))
    return [(f.rule, f.details) for f in det.evaluate(11.0)]


def test_the_catalog_names_every_code_once() -> None:
    codes = [c for group in XID_ACTIONS.values() for c in group]
    assert sorted(codes) == list(range(1, 163))


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (46, "RESET_GPU"),
        (109, "RESET_GPU"),
        (110, "RESET_GPU"),
        (136, "RESET_GPU"),
        (155, "RESET_GPU"),
        (156, "RESET_GPU"),
        (158, "RESET_GPU"),
        (160, "RESTART_BM"),
        (162, "RESET_GPU"),
        (151, "RESTART_VM"),
        (54, "CHECK_MECHANICALS"),
    ],
)
def test_nvidia_fatal_codes_page_with_nvidia_action(code: int, action: str) -> None:
    ((rule, details),) = findings(code)
    assert rule == "gpu_xid_fatal"
    assert details["nvidia_action"] == action and details["nvidia_fatal"] is True and details["known_code"]


@pytest.mark.parametrize(("code", "action"), [(63, "IGNORE"), (92, "IGNORE"), (94, "RESTART_APP")])
def test_codes_the_contract_pages_carry_nvidia_nonfatal_action(code: int, action: str) -> None:
    # DESIGN §3 and the scenario scorer page on these; the finding says what NVIDIA asks for
    ((rule, details),) = findings(code)
    assert rule == "gpu_xid_fatal" and details["nvidia_action"] == action and details["nvidia_fatal"] is False


def test_restart_app_codes_stay_application_tickets() -> None:
    for code in (8, 13, 31, 32, 68, 69):
        ((rule, details),) = findings(code)
        assert rule == "gpu_xid_app" and details["nvidia_action"] == "RESTART_APP"
    assert {c for c, a in XID_ACTION.items() if a in ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45")} >= APP_XIDS


def test_xid_154_follows_the_action_its_message_names() -> None:
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    ((rule, details),) = findings(154, reboot)
    assert rule == "gpu_xid_fatal" and details["nvidia_action"] == "Node Reboot Required"
    ((rule, details),) = findings(
        154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    )
    assert rule == "gpu_xid_app" and details["nvidia_action"] == "None"
    assert recovery_action("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)") == (
        "Drain and Reset"
    )
    assert 154 in FATAL_XIDS  # without a message (the DCGM path) it still pages


def test_a_summary_names_nvidia_action() -> None:
    det = XidDetector()
    det.on_event(Event(10.0, "xid", {"node": "n1", "gpu": "5"}, {"code": 109}))
    (f,) = det.evaluate(11.0)
    assert f.summary == "XID 109 on n1 GPU 5: context switch timeout (NVIDIA action: RESET_GPU)"
