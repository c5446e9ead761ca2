"""The suite's own pytest-xdist grouping (tests/conftest.py): a module-scoped fixture is built once
even when its tests are spread over workers, and the Ray tests share one worker."""
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

pytest.importorskip("xdist")

MODULE = '''
import os
import pytest

@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILT_LOG"], "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 1

@pytest.mark.parametrize("i", range(8))
def test_uses_it(built, i):
    assert built == 1

@pytest.mark.parametrize("i", range(8))
def test_alone(i):
    pass

@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("i", range(4))
def test_ray(i):
    with open(os.environ["RAY_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
'''


def test_a_module_fixture_is_built_once_and_ray_tests_share_a_worker(pytester, tmp_path, monkeypatch):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_grouped=MODULE)
    monkeypatch.setenv("BUILT_LOG", str(tmp_path / "built.log"))
    monkeypatch.setenv("RAY_LOG", str(tmp_path / "ray.log"))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=20)
    assert len((tmp_path / "built.log").read_text().split()) == 1
    assert len(set((tmp_path / "ray.log").read_text().split())) == 1
