"""Collection rules: tests of an integration whose host framework is not installed are not
collected (the vllm-marked tests run in scripts/vllm_check.sh's venv, not in CI)."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("vllm") else ["test_integration_vllm.py"]
