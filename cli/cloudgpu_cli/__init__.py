"""``cloudgpu``: a renter's command line for a CloudGPU hub's REST API (/api/v1/)."""

__version__ = "0.1.0"
