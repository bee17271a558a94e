"""ctlplane: the control plane of vLLM's encoder-cache transfer and KV tiering.

`ctlplane.ec` and `ctlplane.p2p` hold drop-in replacements for vLLM 0.33.0's
control-plane classes, carried out by ctlplane's Rust drivers with the GIL released.
"""

from ctlplane import ec, p2p

__all__ = ["ec", "p2p"]
