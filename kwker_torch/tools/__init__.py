"""Tools users run: the quality tool (``python -m kwker_torch.quality``) and the demo
(``python -m kwker_torch.demo``)."""
