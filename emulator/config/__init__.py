"""Run configuration: TOML -> validated dataclasses (pydantic), one-line errors naming the field.

One module per section, each with its checks: :mod:`.data`, :mod:`.topology`, :mod:`.train`,
:mod:`.cost`, :mod:`.arms`, :mod:`.faults`; :mod:`.run` puts them together, :mod:`.limits` holds the
numbers' bounds, :mod:`.base` the strict model they share and :mod:`.parse` reads a user's file.
"""
from .arms import ArmConfig, SamplingConfig
from .base import FolderName, PartName, _Strict
from .cost import CostConfig
from .data import SHIFTS, ClientTypeConfig, DataConfig
from .faults import FaultsConfig, StragglerConfig
from .limits import (DAY_S, DEFAULT_MAX_SEEDS, INT64, MAX_CLIENTS, MAX_ROUNDS, MIN_MARGIN, Count, Index, Latency, Mbps,
                     RefMs, Rounds, Seconds, Sigma, Weight)
from .parse import (DIRICHLET_CARRIED, ONLY_IN, _one_line, check_modes, check_user_config, load_config, parse_config,
                    read_toml)
from .run import MarginsConfig, RunConfig, config_warnings, parts
from .topology import (ArrivalsConfig, AvailabilityConfig, EdgeLinkConfig, HeterogeneityConfig, LinkConfig,
                       TopologyConfig, arrival_rounds)
from .track import TrackConfig
from .train import TrainConfig

__all__ = ["ArmConfig", "ArrivalsConfig", "AvailabilityConfig", "ClientTypeConfig", "CostConfig", "Count", "DAY_S",
           "DEFAULT_MAX_SEEDS", "DIRICHLET_CARRIED", "DataConfig", "EdgeLinkConfig", "FaultsConfig", "FolderName",
           "HeterogeneityConfig", "INT64", "Index", "Latency", "LinkConfig", "MAX_CLIENTS", "MAX_ROUNDS", "MIN_MARGIN",
           "MarginsConfig", "Mbps", "ONLY_IN", "PartName", "RefMs", "Rounds", "RunConfig", "SHIFTS", "SamplingConfig",
           "Seconds", "Sigma", "StragglerConfig", "TopologyConfig", "TrackConfig", "TrainConfig", "Weight", "_Strict", "_one_line",
           "arrival_rounds", "check_modes", "check_user_config", "config_warnings", "load_config", "parse_config",
           "parts", "read_toml"]
