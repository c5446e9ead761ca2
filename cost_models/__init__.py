"""Cost models: O_g(|g|) group-operation overhead and H_i(n_i) training cost (Eq. 5)."""
from .curves import Curve, ExtrapolationWarning, MeasuredCurve, PiecewiseLinear, Polynomial, linear, quadratic
from .model import TRAINING, CostModel
from .profiles import DeviceProfile, get_curve, get_profile, read_profiles, shipped_profiles

__all__ = ["Polynomial", "PiecewiseLinear", "MeasuredCurve", "Curve", "ExtrapolationWarning", "linear",
           "quadratic", "CostModel", "TRAINING", "DeviceProfile", "get_curve", "get_profile", "read_profiles",
           "shipped_profiles"]
