"""``torch.compile(model, backend="kwker")``: the backend (``backend``: fusion and lowering), the planner that turns
a traced graph into native instructions (``planner``), the arena that places their buffers (``arena``) and the
step executor that runs them (``executor``)."""
