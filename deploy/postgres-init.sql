-- Forge's own database and role, next to Temporal's (created by auto-setup).
CREATE ROLE forge LOGIN PASSWORD 'forge';
CREATE DATABASE forge OWNER forge;
