"""Backbones, incremental heads and local weight loading."""
from gtep.models.backbones import BACKBONES, backbone_exists, create_backbone
from gtep.models.base import Backbone
from gtep.models.heads import IncrementalNet, LinearHead

__all__ = ["BACKBONES", "Backbone", "backbone_exists", "create_backbone", "IncrementalNet", "LinearHead"]
