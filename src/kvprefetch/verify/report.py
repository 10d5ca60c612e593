"""What ``verify-kernel`` reports: each check's verdict (``pass``, ``fail`` or ``not
checked``) and everything gathered to judge it. Only checks that ran can pass, and the verdict
passes only when every check that ran passed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"


@dataclass(frozen=True)
class Check:
    name: str
    tree: str
    status: str
    detail: str


@dataclass
class VerifyReport:
    workdir: str
    checks: list[Check] = field(default_factory=list)
    envs: dict[str, Any] = field(default_factory=dict)
    sass: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None
    # the identity runs with one twin forced (KVPREFETCH_GQA=<GxS>), by twin
    gpu_twins: dict[str, Any] = field(default_factory=dict)
    # overlay environments: tree -> the overlay probes (routing on, off) and the driver stub
    overlay: dict[str, Any] = field(default_factory=dict)
    # seconds spent gathering (probes, disassembly, identity runs) and in all
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def report_path(self) -> Path:
        return Path(self.workdir) / "verify" / "report.json"

    @property
    def passed(self) -> bool:
        ran = [c for c in self.checks if c.status != NOT_CHECKED]
        return bool(ran) and all(c.status == PASS for c in ran)

    def add(self, name: str, tree: str, ok: bool | None, detail: str) -> None:
        status = NOT_CHECKED if ok is None else (PASS if ok else FAIL)
        self.checks.append(Check(name, tree, status, detail))

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "workdir": self.workdir,
                "checks": [c.__dict__ for c in self.checks], "envs": self.envs,
                "sass": self.sass, "gpu": self.gpu, "gpu_twins": self.gpu_twins,
                "overlay": self.overlay, "timing": self.timing}
