"""The kill campaign: a real job killed over and over against real servers, every event checked by id.

``python -m integration.campaigns.campaign`` runs it (RELIABILITY.md has the commands and figures);
``integration/test_campaign.py`` runs it at a small size.  Its helpers come from :mod:`tests.lib`.
"""
