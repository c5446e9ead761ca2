"""The physical bounds of a run config's numbers (docs/guide/config.md, "Limits") and the
annotated types that carry them."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

# Physical bounds (docs/guide/config.md, "Limits"): beyond them a run's numbers stop meaning anything
# (a transfer of 10^300 s, a model overflowing to inf) long before they stop being floats.
MAX_CLIENTS = 10**8     # clients of one run: each holds >= 1 training sample, and no dataset has 10^8
MAX_ROUNDS = 10**6      # global rounds, group rounds x epochs, intervals counted in rounds
INT64 = 2**63 - 1
DAY_S = 86_400.0
Count = Annotated[int, Field(ge=1, le=MAX_CLIENTS)]
Rounds = Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
Mbps = Annotated[float, Field(ge=1e-6, le=1e9)]          # 1 bit/s .. 1 Pbit/s
Latency = Annotated[float, Field(ge=0, le=DAY_S)]        # one-way, at most a day
Sigma = Annotated[float, Field(ge=0, le=2)]               # lognormal spread: exp(2 x 6 sigma) is 1.6e5
Seconds = Annotated[float, Field(ge=1, le=1e9)]          # a duration drawn again and again: >= 1 s
Index = Annotated[int, Field(ge=0, le=MAX_CLIENTS)]
Weight = Annotated[float, Field(ge=0, le=1e6)]
RefMs = Annotated[float, Field(ge=1e-6, le=1e9)]         # ms per sample, FedScale's computation trace

# The smallest margin a study can resolve: a test split of 10,000 samples moves accuracy in steps of
# 1e-4, and the cost curves are measured to far worse than 0.01 %, so a smaller margin can only be
# met by identical results and the study would run to max_seeds undecided.
MIN_MARGIN = 1e-4

# A study with seeds = "auto" and no max_seeds stops adding seeds here.
DEFAULT_MAX_SEEDS = 20
