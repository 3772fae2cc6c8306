"""rootbench: can this model fix a broken Linux server?"""

__version__ = "0.1.0"
