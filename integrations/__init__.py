"""pegmask.integrations: pegmask inside other inference stacks, with the same compiled grammars
and matchers as the engine.

* `pegmask.integrations.transformers`: a `LogitsProcessor` for `model.generate`;
* `pegmask.integrations.vllm`: tool and reasoning parsers for every dialect (`pegmask-<dialect>`)
  registered by a `vllm.general_plugins` entry point, and a logits processor that applies a
  request's grammar (`pegmask[vllm]`);
* `pegmask.integrations.sglang`: a grammar backend, `--grammar-backend pegmask`
  (`pegmask[sglang]`).

`pegmask.integrations.constraints` is the constraint format they share. Each module imports its
host framework, so import only the one you use.
"""
