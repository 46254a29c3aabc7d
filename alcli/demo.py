"""The small CNN behind the shipped demo (`data/demo/`, built by `scripts/make_demo.py`).

It lives in the package so that `arch: alcli.demo:DigitsCNN` imports from any working directory.
"""
from torch import nn


class DigitsCNN(nn.Module):
    """1x8x8 grayscale digits -> class logits [B, num_classes]."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),                                   # [B, 2w, 4, 4]
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, 64), nn.ReLU(),
                                  nn.Linear(64, num_classes))

    def forward(self, x):
        return self.head(self.features(x))
