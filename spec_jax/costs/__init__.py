"""What a decoding round costs on a chip: a leaf package that decoding and jobs both import
(it imports only models, sharding and checkpoints' shapes).

Modules:
  chips        the chips: published peaks, HBM, interconnect, slot multiple (the CPU too)
  memory       the dry run: what one device holds for a plan (weights, caches, activations)
  roofline     a round's calls with their FLOPs and bytes: the upper bound at the peaks
  efficiency   a chip's fitted fractions and form: the time of a call, a point, a round
  points       measured points (the H200's in assets/costs/, a bench report's), their calls
  fit          the fit, its held-out report (per point: fitted or held out, the error), forms
  calibration  the calibrated chips; a tier's cost at batch B, T tokens and S slots
               (`for_chip`, `Tier`, `CostModel`); predictions beside the upper bound
"""
