"""cuinfer benchmark suites: cuinfer beside its peers (FlashInfer, torch SDPA) in one run, docs/benchmarks.md method.

Run from the repository root: ``python -m bench {merge,decode,prefill,plan,all} [--cases D1,D5] ...``.
Nothing here is imported by the ``cuinfer`` package; torch, FlashInfer and cuinfer are imported lazily so that
``python -m bench --help`` and the CPU tests work on a machine without a GPU.
"""
