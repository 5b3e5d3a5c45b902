"""A bus: one Pub/Sub subscription or Kafka topic read once for several event types, each message routed to the
type that claims it (:mod:`event_etl.rules.routing`, pure), the shared source session the types' lanes read through
(:mod:`event_etl.bus.session`) and the tasks that read a split once and write every type's files
(:mod:`event_etl.bus.task`)."""
