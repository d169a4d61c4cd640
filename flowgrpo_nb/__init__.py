__version__ = "0.1.0"

from . import display  # first of all: drops third-party notices (transformers' torchvision one) in every process
