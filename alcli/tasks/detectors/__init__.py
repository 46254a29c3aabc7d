"""The detectors' engine internals, which tasks/detection.py (and through it instances.py and
keypoints.py) runs: no task of their own here.

    batched.py                  the one-stage detectors through the engine, one batch per padded size
    retinanet.py, fcos.py, ssd.py  one each: backbone and head as one module, dense targets, per-image loss
    rcnn.py                     Faster, Mask and Keypoint R-CNN through the engine
    roi_align.py                the R-CNNs' multi-scale RoIAlign as one embedding bag
"""
