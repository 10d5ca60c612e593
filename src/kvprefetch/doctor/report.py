"""The preflight's vocabulary and result: a ``Check`` row (name, status, detail, fix) and the
frozen ``DoctorReport`` that ``run_doctor`` collects them into, with its JSON form and the
``ConfigError`` a failed preflight raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError

Status = Literal["ok", "warn", "fail", "skip"]
Mode = Literal["full", "kernels-only", "overlay"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class DoctorReport:
    mode: str
    arch_list: str
    checks: tuple[Check, ...]
    mode_reason: str = ""  # why this mode was checked (see choose_mode)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "mode": self.mode, "mode_reason": self.mode_reason,
                "arch_list": self.arch_list, "checks": [c.__dict__ for c in self.checks]}

    def raise_if_failed(self) -> None:
        """ConfigError listing each failing check's cause, then each one's fix."""
        bad = self.failures
        if not bad:
            return
        cause = f"preflight ({self.mode}, --arch {self.arch_list}) found {len(bad)} problem(s):"
        cause += "".join(f"\n  - {c.name}: {c.detail}" for c in bad)
        fix = "".join(f"\n  - {c.name}: {c.fix or 'see above'}" for c in bad)
        raise ConfigError(cause, fix)
