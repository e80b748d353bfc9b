"""What every plan/run wrapper shares: the device, the shape of a public call, its buffers and outputs, the checked
options, and the plan/run lifecycle itself (``wrapper``)."""
