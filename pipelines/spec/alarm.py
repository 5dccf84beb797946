"""The spec's regression and tracking sections: the alarm's statistics and what the training runs
sample into MLflow."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from pipelines.spec.sections import Section


class RegressionSpec(Section):
    """The regression alarm (pipelines/report/regression.py): this run against its history."""

    history: int = Field(
        10, ge=2, le=100, description="Earlier FINISHED runs of the same spec and hardware compared against."
    )
    min_history: int = Field(
        3, ge=2, le=100, description="Fewer earlier runs than this: no statement, the check says the history is short."
    )
    alpha: float = Field(
        0.01, gt=0, lt=0.5, description="Significance of the one-sided test (A/A false alarms: bench_regression.py)."
    )
    min_effect: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Smallest throughput slowdown (fraction) that is a regression, however significant.",
    )
    confirm_alpha: float = Field(
        0.1,
        gt=0,
        lt=0.5,
        description="Significance at which a suspect's rerun confirms its alarm (alpha where that is "
        "larger): a second stage, so the false alarms that stand are about alpha x confirm_alpha.",
    )
    host_alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Significance of the two-sided test that the host's canary moved; where it did, the test "
        "relative to the canary decides, elsewhere the raw one.",
    )
    prediction_error_rise: float = Field(
        0.10, gt=0, description="Smallest rise of the median absolute prediction error (absolute) that is a regression."
    )
    reference_hardware: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="A hardware label the report sets this run's throughput against, per configuration both "
        "ran: that label's newest pipeline run in the suite's experiment (onboarding: the hardware a team has).",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "throughput_drop" in data:
            raise ValueError(
                "throughput_drop: renamed min_effect (the smallest slowdown that is a regression, now judged "
                "against the history of the spec with a statistical test)"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> RegressionSpec:
        if self.min_history > self.history:
            raise ValueError(f"min_history: {self.min_history} is above history ({self.history})")
        return self


class TrackingSpec(Section):
    system_metrics: bool = Field(True, description="Sample CPU/memory into the training runs.")
