"""ragspec.bench.provenance: what a results file says about where its figures came from."""

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
