"""The webhook's certificates, managed by the operator itself: certs.py plans a CA and
a serving certificate (pure, the clock passed in); webhook_certs.py keeps them in their
Secret, in both webhook configurations' caBundle and in the files the server serves.

May import: the operator's base and apiserver/.
"""
