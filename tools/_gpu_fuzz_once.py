import sys, traceback
sys.path.insert(0, "tests")
import numpy as np
from hypothesis import given, settings, HealthCheck, strategies as st
from strategies_programs import programs, check_against_model
bad = []
@settings(max_examples=int(sys.argv[1]), deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(program=programs(), seed=st.integers(0, 2**32 - 1))
def check(program, seed):
    inputs = program.make_inputs(np.random.default_rng(seed))
    try:
        check_against_model(program, inputs, "cuda")
    except Exception as e:
        bad.append((program.source, program.sizes, seed, "".join(traceback.format_exception_only(e))[-600:]))
        raise
try:
    check()
except Exception:
    pass
print("bad", len(bad))
for b in bad[:3]:
    print(b[0]); print(b[1], b[2]); print(b[3]); print("----")
