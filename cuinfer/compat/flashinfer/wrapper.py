"""What the three FlashInfer-style wrappers share: the workspace buffer and its device, CUDA-graph settings, the plan
they were last given (for ``forward()``'s re-plan and the per-call ``window_left`` check) and the ending of ``run()``
(FlashInfer's ``v_scale``, ``lse_base`` and ``lse_layout``)."""

from __future__ import annotations

from typing import Any, ClassVar

from cuinfer.compat.flashinfer import common


class CompatWrapper:
    """A FlashInfer wrapper's state around one cuinfer wrapper (``self._core``, made by the subclass)."""

    _API: ClassVar[str] = "wrapper"
    _RUN_ARRAYS: ClassVar[tuple[str, ...]] = ("q",)  # run()'s array arguments, by name

    def __init__(self, float_workspace_buffer: Any, kv_layout: Any, use_cuda_graph: bool) -> None:
        self._kv_layout = common.kv_layout(kv_layout)
        self._device_id = common.device_of(float_workspace_buffer)
        self._float_workspace_buffer = float_workspace_buffer
        self.device = getattr(float_workspace_buffer, "device", None)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._core: Any = None
        self._fixed_batch_size = 0
        self._plan_call: tuple[tuple, dict] | None = None  # (positional, keyword) arguments of the last plan()
        self._window_left = -1
        self._max_total_num_rows: int | None = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: Any, int_workspace_buffer: Any) -> None:
        """Accepted for FlashInfer code: cuinfer keeps its own workspace, so the buffers are only kept."""
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer

    def _core_settings(self) -> dict[str, Any]:
        """cuinfer constructor keywords: CUDA graphs at FlashInfer's fixed batch size, the workspace, the device."""
        graph = self._use_cuda_graph
        return dict(
            use_cuda_graph=graph, max_batch_size=max(self._fixed_batch_size, 1) if graph else None,
            workspace_bytes=common.graph_workspace_bytes(self._float_workspace_buffer) if graph else None,
            device=self._device_id,
        )  # fmt: skip

    def _check_graph_batch(self, batch_size: int, qo_indptr: Any = None) -> None:
        """FlashInfer's CUDA-graph rules: the batch size of the constructor's buffers, and (prefill, ``qo_indptr``
        given) no more query rows than the first plan had."""
        if not self._use_cuda_graph:
            return
        total_rows = None if qo_indptr is None else int(qo_indptr[-1])  # (one element read, graph mode only)
        if batch_size != self._fixed_batch_size:
            raise ValueError(
                f"The batch size should be fixed in cudagraph mode, the runtime batch size {batch_size} mismatches "
                f"the batch size set during initialization {self._fixed_batch_size}"
            )
        if total_rows is not None:
            if self._max_total_num_rows is None:
                self._max_total_num_rows = total_rows
            elif total_rows > self._max_total_num_rows:
                raise ValueError(
                    f"The total number of rows in qo_indptr {total_rows} in cuda graph mode cannot exceed the number "
                    f"of rows set during initialization {self._max_total_num_rows}."
                )

    def _remember(self, args: tuple, kwargs: dict[str, Any], window_left: int) -> None:
        self._plan_call = (args, kwargs)
        self._window_left = window_left

    def _check_run_window(self, window_left: Any) -> None:
        """run(window_left=...): None, or the plan's value (FlashInfer asserts the same on its fa2 path)."""
        if window_left is not None and int(window_left) != self._window_left:
            raise ValueError(
                f"run(window_left={window_left}) differs from the window_left={self._window_left} given to plan(); "
                "the window is part of the plan: call plan() with the new window_left"
            )

    def _forward(self, call: dict[str, Any], return_lse: bool, **run_kwargs: Any) -> Any:
        """The deprecated ``forward()`` / ``forward_return_lse()`` (``call``: their arguments) take attention options
        that replace the plan's, as in FlashInfer: plan again with them when they differ (a host-side cost per
        call), then run on the arrays ``_RUN_ARRAYS`` names."""
        if self._plan_call is None:
            raise ValueError(f"{self._API}.forward() needs a plan: call plan() (or begin_forward()) first")
        args, kwargs = self._plan_call
        options = {name: call[name] for name in FORWARD_OPTIONS if name in call}
        if any(kwargs.get(name, _UNSET) != value for name, value in options.items()):
            self.plan(*args, **{**kwargs, **options})
        return self.run(*(call[name] for name in self._RUN_ARRAYS), return_lse=return_lse, **run_kwargs)

    def plan(self, *args: Any, **kwargs: Any) -> None:  # (each wrapper defines its own)
        raise NotImplementedError

    def run(self, *args: Any, **kwargs: Any) -> Any:  # (each wrapper defines its own)
        raise NotImplementedError

    def _finish(self, result: Any, return_lse: bool, v_scale: Any, lse_base: str = "log2", lse_layout: str = "NH",
                lse_dst: Any = None) -> Any:  # fmt: skip
        """cuinfer's result as FlashInfer returns it: ``o`` times ``v_scale``, and the lse in the base and layout
        asked for when ``return_lse``."""
        o, lse = result if isinstance(result, tuple) else (result, None)
        o = common.scale_output(o, v_scale)
        if not return_lse:
            return o
        return o, common.finish_lse(lse, lse_base, lse_layout, lse_dst)


_UNSET = object()
FORWARD_OPTIONS = (*common.OPTION_NAMES, "causal", "use_fp16_qk_reduction")
