"""The local Kafka launcher (``flywheel kafka start|stop|status``)."""
