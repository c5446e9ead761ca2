import gc
import math
import sys

import pytest
import torch

from groupfel.emulator import tables


@pytest.mark.parametrize("shape,dtype", [((60, 19810), torch.float32), ((60, 19810), torch.float64), ((3, 5), torch.float32)])
def test_a_table_is_an_empty_tensor_of_its_shape_that_outlives_its_mapping_name(shape, dtype):
    t = tables.empty(shape, dtype)
    big = math.prod(shape) * dtype.itemsize >= tables.HUGE_PAGE
    gc.collect()
    assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
    t.fill_(2)
    rows = t[:2]
    del t
    gc.collect()
    rows.add_(1)   # still mapped: the tensor keeps its mapping
    assert bool((rows == 3).all())
    if sys.platform == "linux" and big:
        assert rows.data_ptr() % tables.HUGE_PAGE == 0   # huge-page aligned where it may use huge pages
