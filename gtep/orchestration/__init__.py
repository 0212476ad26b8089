"""The edge of the system: the only package that imports Ray and MLflow."""
