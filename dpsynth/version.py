"""dpsynth's version: a leaf module (it imports nothing), so code that
reports the version (a worker's identity, the manifest) does not import the
package root, which imports the API on first use."""

__version__ = "0.2.0"
