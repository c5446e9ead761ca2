"""The `[[arms]]` section: each arm's grouping, sampling and aggregation."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .base import FolderName, PartName, _Strict
from .limits import Count, Rounds


class SamplingConfig(_Strict):
    # other keys are the policy's parameters (a plug-in's dataclass fields), checked when the arm is planned
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    policy: PartName = Field("random", description="The sampling policy (see Policies below), an installed "
                             "plug-in's short name, or an import path \"module:Class\".")
    groups_per_round: Count | None = Field(None, description="S: groups sampled each round (capped at "
                                         "the groups formed, with a warning).")
    data_fraction: float | None = Field(None, gt=0, le=1, description="Instead of groups_per_round: S is "
                                        "the number of average-sized groups holding this share of the data.")
    fraction_of: Literal["groups", "all-clients"] = Field(
        "groups", description="Whose data data_fraction is a share of: the groups' (every client "
        "grouped) or all clients', those a grouping leaves out included (the Group-FEL authors' code: "
        "S = round(fraction · all clients' samples / the groups' mean samples)).")
    draw: Literal["systematic", "successive"] = Field(
        "systematic", description="How the S groups are drawn: systematic (each group with inclusion "
        "probability π_g = min(1, c·p_g), which makes Eq. 4 unbiased) or successive (draw one, remove it, "
        "renormalise: numpy's choice(replace=False), the Group-FEL authors' code; the aggregation still "
        "weighs by π_g, so Eq. 4 is then biased, as in the authors' runs wherever no S·p_g exceeds 1: "
        "theirs divide by S·p_g uncapped).")

    @model_validator(mode="after")
    def _one(self):
        if (self.groups_per_round is None) == (self.data_fraction is None):
            raise ValueError("set exactly one of groups_per_round or data_fraction")
        if self.fraction_of != "groups" and self.data_fraction is None:
            raise ValueError("fraction_of applies to data_fraction; set data_fraction instead of groups_per_round, "
                             "or drop fraction_of")
        return self


class ArmConfig(_Strict):
    name: FolderName = Field(description="The arm's name (its directory in the run).")
    grouping: dict[str, Any] = Field(default_factory=lambda: {"policy": "covg"},
                                     description="`policy` names the grouping policy; the other keys are its "
                                     "parameters (see Policies below).")
    # None rather than a default object, so that "not set" survives a dump and re-parse.
    sampling: SamplingConfig | None = Field(None, description="How the cloud samples groups; unset: global "
                                            "mode samples 4 groups a round at random, per-group mode trains "
                                            "every group every round.")
    aggregation: PartName = Field("biased", description="The cloud's aggregation rule: biased, unbiased "
                                  "(Eq. 4) or stabilized (Eq. 39), an installed plug-in's short name, or an "
                                  "import path \"module:Class\".")
    regroup_every: Rounds | None = Field(None, description="Regroup the clients every this many rounds "
                                      "(Sec. 5.2); unset: group once.")

    @property
    def sampler(self) -> SamplingConfig:
        """The sampling in effect (global mode's default when ``sampling`` is not set)."""
        return self.sampling if self.sampling is not None else SamplingConfig(groups_per_round=4)
