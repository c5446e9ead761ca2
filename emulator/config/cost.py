"""The `[cost]` section: the device profiles, curves and group operations of the Eq. 5 charges."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

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
    edge_power: str | None = Field(None, description="Charge the edge servers' energy too (needs cost.energy): "
                                   "the device whose [[power]] tables give a server's aggregation, secagg_server "
                                   "and idle watts (shipped: raspberry-pi-4-edge, a Raspberry Pi 4 as edge "
                                   "server, its busy states assumed; or your own device in cost.profiles_file). "
                                   "Each edge is charged its aggregation and secure-aggregation seconds "
                                   "(topology.edge_profile's curves) at those powers and is idle for the rest of "
                                   "each round it serves (every round under full-fleet; never under marginal). "
                                   "Unset: edges use no energy.")
    cloud_power: str | None = Field(None, description="Charge the cloud's aggregation energy too (needs "
                                    "cost.energy): the device whose [[power]] tables give its aggregation and "
                                    "idle watts; its seconds are topology.edge_profile's aggregation curve at the "
                                    "number of group models it averages each round. Unset: the cloud is free.")
    edge_pue: float = Field(1.0, ge=1.0, le=10.0, description="The edge sites' power usage effectiveness: an "
                            "edge's joules are its server's × this (1: no facility overhead).")
    cloud_pue: float = Field(1.0, ge=1.0, le=10.0, description="The cloud data centre's power usage "
                             "effectiveness: the cloud's joules are its server's × this (1: no overhead).")

    carbon_intensity: float | None = Field(None, ge=0.0, le=1e4, description="Price grams CO2e too (needs "
                                           "cost.energy): the grid's carbon intensity in g/kWh, the same for "
                                           "every client, edge and cloud and at every time (with "
                                           "carbon_intensity_file: what the file leaves out). grams = joules / "
                                           "3.6e6 × intensity. Unset: no carbon columns.")
    carbon_intensity_file: path_of("carbon intensity file") | None = Field(
        None, description="An hourly carbon intensity (needs cost.energy): an Electricity Maps export (CSV with "
        "Datetime (UTC) and a carbon intensity column in gCO₂eq/kWh; the life-cycle one where present) or a "
        "SimGrid carbon-footprint trace (lines 'host timestamp g/kWh', host client, edge, cloud or *, "
        "simulated seconds). Each charge is priced at its group round's (or round's) start; the manifest "
        "names the file and column (docs/energy.md, Carbon).")
    carbon_start: str | None = Field(None, description="The UTC date and time simulated second 0 is in an "
                                     "Electricity Maps carbon_intensity_file (ISO 8601, e.g. 2024-06-01 12:00); "
                                     "unset: the file's first hour. The file repeats after its last hour.")

    @model_validator(mode="after")
    def _sites_need_energy(self):
        for key in ("edge_power", "cloud_power", "carbon_intensity", "carbon_intensity_file"):
            if getattr(self, key) is not None and not self.energy:
                raise ValueError(f"{key} prices joules: set cost.energy = true, or remove {key}")
        if self.carbon_start is not None and self.carbon_intensity_file is None:
            raise ValueError("carbon_start sets second 0 of carbon_intensity_file: give the file, or remove it")
        return self
