"""ragspec.bench.provenance: what a results file says about where its figures came from."""

import os
import subprocess
import sys

from ragspec.bench import provenance


def test_settings_keep_the_variables_that_change_speed_and_leave_out_secrets():
    env = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "0",
           "MKL_NUM_THREADS": "1", "RAGSPEC_PREFILL_DTYPE": "bf16", "RAGSPEC_AMX": "1",
           "RAGSPEC_MILVUS_TOKEN": "t", "RAGSPEC_GENERATOR_KEY": "k", "RAGSPEC_AUTH": "a",
           "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    got = provenance.settings(env)
    assert got == {"GOMP_SPINCOUNT": "0", "MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "2",
                   "OMP_WAIT_POLICY": "PASSIVE", "RAGSPEC_AMX": "1",
                   "RAGSPEC_PREFILL_DTYPE": "bf16"}
    assert list(got) == sorted(got)
    assert provenance.settings({"PATH": "/usr/bin"}) == {}  # every default held


def test_settings_are_what_the_process_began_with_not_what_libraries_set_later():
    """A library may set OpenMP variables for itself on import (joblib sets KMP_*): the record
    names what the command was started with."""
    code = ("import os; os.environ['RAGSPEC_SET_LATER'] = '1'; "
            "from ragspec.bench import provenance; print(sorted(provenance.settings()))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(provenance.SPEED_PREFIXES)}
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "['OMP_WAIT_POLICY']"
