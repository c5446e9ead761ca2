"""Training algorithms (``train.algorithm``): the base class and its hooks (:mod:`.base`), then one
module per family, each registering its algorithms through the base's registry exactly as a
plug-in module would: Group-FEL's own (:mod:`.classic`: FedAvg, FedProx, SCAFFOLD), HCCT's
baselines (:mod:`.hcct`) and FedCollab's personalised methods (:mod:`.personal`)."""
from .base import Algorithm, AlgorithmContext, AlgorithmState, GroupUpdate, algorithms, make_algorithm
from . import classic, hcct, personal  # noqa: E402  (register the shipped families)
from .classic import FedAvg, FedProx, Scaffold

__all__ = ["Algorithm", "AlgorithmContext", "AlgorithmState", "GroupUpdate", "algorithms", "make_algorithm",
           "FedAvg", "FedProx", "Scaffold", "classic", "hcct", "personal"]
