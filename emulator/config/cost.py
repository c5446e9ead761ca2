"""The `[cost]` section: the device profiles, curves and group operations of the Eq. 5 charges."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Strict, path_of


class CostConfig(_Strict):
    task: str = Field("cifar10-resnet", description="The task half of each device's profile name "
                      "`<device>/<task>`.")
    training: str | None = Field(None, description="The training curve H (sgd, fedprox, scaffold, ...); "
                                 "unset: train.algorithm's curve where every profile has one, else sgd.")
    group_operations: list[str] | None = Field(None, description="The group operations O_g charged, each "
                                               "its own ledger component; unset: [\"secagg\"], or "
                                               "[\"scaffold-secagg\"] (model + variates) under scaffold.")
    profiles_file: path_of("profile file") | None = Field(None, description="A CSV or TOML file of your own curves (the shipped "
                                      "file's columns). A profile named like a shipped one replaces only the "
                                      "curves it has; the shipped profile supplies the rest.")
    energy: bool = Field(False, description="Charge energy too: each client's joules per state (training, "
                         "group_operation, transmit, receive, listen, idle) = the device's power in the state × "
                         "the simulated seconds it spent there, from the shipped power profile (raspberry-pi-4: "
                         "every state, those without a measurement marked assumed) and cost.profiles_file's "
                         "[[power]] tables. Off: no energy columns.")
    energy_accounting: Literal["group-rounds", "full-fleet", "marginal"] = Field(
        "group-rounds", description="What cost.energy counts: group-rounds (each sampled client from its "
        "group round's start to its end, idle while it waits), full-fleet (also every online client idle "
        "between its work, sampled or not) or marginal (the work above idle power: idle is 0 W and every "
        "other state its power less idle).")
