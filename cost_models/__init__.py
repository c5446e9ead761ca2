"""Cost models: O_g(|g|) group-operation overhead and H_i(n_i) training cost (Eq. 5)."""
from .curves import Polynomial, linear, quadratic
from .model import TRAINING, CostModel
from .profiles import DeviceProfile, get_profile, read_profiles, shipped_profiles

__all__ = ["Polynomial", "linear", "quadratic", "CostModel", "TRAINING", "DeviceProfile",
           "get_profile", "read_profiles", "shipped_profiles"]
