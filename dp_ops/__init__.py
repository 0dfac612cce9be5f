"""Pure numpy differential-privacy math and accounting (no Beam, no TF)."""
