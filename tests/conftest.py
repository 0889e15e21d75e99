"""Collection rules: tests of an integration whose host framework is not installed are not
collected (the vllm-marked tests run in scripts/vllm_check.sh's venv, the sglang-marked ones in
scripts/make_sglang_venv.sh's, not in CI)."""

import importlib.util
import os

collect_ignore = [
    name for module, name in (("vllm", "test_integration_vllm.py"),
                              ("sglang", "test_integration_sglang.py"))
    if importlib.util.find_spec(module) is None
]

# Engines built by tests run eagerly unless a test asks for the compiled one-row step
# (tests/test_compiled_step.py): building it in the background of every test's engine would
# take a core from the suite for seconds each.
os.environ.setdefault("PEGMASK_COMPILED_STEP", "0")
