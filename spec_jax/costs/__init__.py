"""What a decoding round costs on a chip: a leaf package that decoding and jobs both import
(it imports only models, sharding and checkpoints' shapes).

Modules:
  chips        the chips: published peaks, HBM, interconnect (CPU: this machine's)
  memory       the dry run: what one device holds for a plan (weights, caches, activations)
  roofline     a round's calls with their FLOPs and bytes: the upper bound at the peaks
  calibration  the attainable time of a call from a chip's fitted efficiencies
  model        the cost of a tier (AR, chain, tree) at batch B, T verified tokens and a
               context of S slots on a chip; the fit and its held-out report
"""
