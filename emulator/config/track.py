"""The ``[track]`` table: where a run, sweep or study logs its rounds while it goes (TensorBoard or
MLflow). It changes no result, so it is never saved in a run's config.json: a run tracked and one
not tracked are the same run (:mod:`groupfel.experiments.track` does the logging)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Strict, path_of

class TrackConfig(_Strict):
    """Log every evaluated round, the resolved config and the verdicts to an experiment tracker, live."""
    tracker: Literal["tensorboard", "mlflow"] = Field(description="tensorboard: event files (default under the run "
                                                      "folder's `tensorboard/`); mlflow: the tracking server or store "
                                                      "at `uri`, else `MLFLOW_TRACKING_URI`, else MLflow's default.")
    dir: path_of("TensorBoard log folder") | None = Field(None, description="tensorboard: log into `<dir>/<run "
                                                          "folder's name>` instead of `<run folder>/tensorboard`.")
    uri: str | None = Field(None, min_length=1, description="mlflow: the tracking URI (http://host:port, "
                            "sqlite:///mlflow.db, ...); default `MLFLOW_TRACKING_URI`, else MLflow's default.")
    experiment: str | None = Field(None, min_length=1, description="mlflow: the experiment's name (created if "
                                   "missing); default `MLFLOW_EXPERIMENT_ID` / `MLFLOW_EXPERIMENT_NAME`, else "
                                   "MLflow's Default experiment.")
    optional: bool = Field(False, description="A tracker that cannot be reached at the start: false refuses the run "
                           "before any work; true runs without tracking after a warning.")
    report: bool = Field(True, description="mlflow: build the study's report.html (`groupfel report`, seconds at "
                         "the end) and log it with the plots.")
    every_s: float = Field(2.0, gt=0, le=3600, description="How often (seconds of wall time) the run looks for newly "
                           "evaluated rounds to log.")
