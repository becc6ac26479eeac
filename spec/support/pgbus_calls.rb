# frozen_string_literal: true

# What pgbus calls on the objects pgbus-hub hands it, per pgbus release: the list
# spec/pgbus_surface_spec.rb exercises on live objects (through spec/support/pgbus_standin/
# surface_probe.rb) and docs/pgbus-surface.md shows (`rake docs:surface`). What pgbus-hub needs of
# pgbus is the other half, in lib/pgbus/hub/pgbus_adapter.rb (checked at install).
module PgbusCalls
  # The objects, by what pgbus builds them with (the pre-hub Listener: pgbus before 0.13.1).
  OBJECTS = {
    hub_client: ["0.13.1", nil, "HubClient.new(socket_path:, dispatch_queue:, ack_timeout:, on_failure:, logger:)",
                 "Pgbus::Hub::FailoverListenerAsHubClient"],
    master_hub: ["0.13.1", nil, "MasterHub.new(socket_path:, config:, logger:, status_interval:, ...)",
                 "Pgbus::Hub::PgbusMasterHub"],
    listener: [nil, "0.13.1", "Listener.new(pg_connection:, dispatch_queue:, health_check_ms:, logger:, ...)",
               "Pgbus::Hub::FailoverListener"]
  }.freeze

  # Where each object is exercised: its live states in order, then stopped.
  STATES = {
    hub_client: %i[failed_over_at_start on_hub_after_fail_back on_hub failed_over stopped],
    master_hub: %i[started stopped],
    listener: %i[failed_over_at_start on_hub_after_fail_back on_hub failed_over stopped]
  }.freeze

  # Our FailoverListener's #state in each (FailoverState's words, ext/pgbus_hub_core/src/failover_state.rs):
  # a state is named by that word, and by how it got there where two share one.
  LISTENER_STATE = { failed_over_at_start: :failed_over, on_hub_after_fail_back: :on_hub, on_hub: :on_hub,
                     failed_over: :failed_over, stopped: :stopped }.freeze

  LIVE = { dead?: { failed_over_at_start: true, on_hub_after_fail_back: false, on_hub: false, failed_over: true, stopped: false },
           hub_healthy?: { failed_over_at_start: false, on_hub_after_fail_back: true, on_hub: true, failed_over: false, stopped: false } }.freeze

  Call = Struct.new(:object, :method, :args, :result, :since, :meaning, :states, :values, keyword_init: true)

  # Result kinds: :self; :done_or_nil (:done in every live state, nil once stopped); :nil; :boolean
  # (with the value per state in +values+); :threads (Ruby Threads alive now: some while live, [] once
  # stopped); :integer; :string. +states+: where the call is made (default: every state of the object).
  CALLS = [
    [:hub_client, :connect, "", :self, nil, "starts this worker's listener at pgbus's socket_path; raises " \
                                            "HubUnavailableError only when no listener can be built", %i[failed_over_at_start on_hub]],
    [:hub_client, :ensure_listening, "queue", :done_or_nil, nil, "returns once LISTEN runs for the queue (nil: not " \
                                                                 "confirmed in time, or after stop)"],
    [:hub_client, :remove_listening, "queue", :nil, nil, "unsubscribes; never raises"],
    [:hub_client, :hub_healthy?, "", :boolean, nil, "the hub serves this worker and its last status said healthy",
     nil, LIVE[:hub_healthy?]],
    [:hub_client, :dead?, "", :boolean, nil, "the hub's transport is gone (this worker's own connection serves it)",
     nil, LIVE[:dead?]],
    [:hub_client, :threads, "", :threads, "0.15", "the Ruby threads this worker's listener owns"],
    [:hub_client, :stop, "", :self, nil, "stops the listener and joins its threads (bounded)", %i[stopped]],
    [:master_hub, :start, "", :self, nil, "the shared native hub listens at socket_path", %i[started]],
    [:master_hub, :socket_path, "", :string, nil, "where it listens"],
    [:master_hub, :dropped_durable_wakes, "", :integer, nil, "durable wakes dropped under backpressure"],
    [:master_hub, :evicted_workers, "", :integer, nil, "workers evicted for not draining"],
    [:master_hub, :threads, "", :threads, "0.15", "the Ruby threads the native hub owns (its log thread)"],
    [:master_hub, :stop, "", :self, nil, "stops the hub and unlinks its socket; idempotent", %i[stopped]],
    [:listener, :start, "", :self, nil, "connects (hub or own connection); idempotent", %i[failed_over_at_start on_hub]],
    [:listener, :ensure_listening, "queue", :done_or_nil, nil, "returns once LISTEN runs (nil: not confirmed in time)"],
    [:listener, :remove_listening, "queue", :nil, nil, "unsubscribes; never raises"],
    [:listener, :stop, "", :self, nil, "stops and joins its threads (bounded)", %i[stopped]]
  ].map do |object, method, args, result, since, meaning, states, values|
    Call.new(object: object, method: method, args: args, result: result, since: since, meaning: meaning,
             states: states || STATES.fetch(object), values: values)
  end.freeze

  module_function

  # The calls a pgbus release (a version String) makes, for the objects it builds.
  def calls(version)
    release = Gem::Version.new(version)
    CALLS.select do |call|
      first, before = OBJECTS.fetch(call.object)
      [first, call.since].compact.all? { |v| release >= Gem::Version.new(v) } &&
        (before.nil? || release < Gem::Version.new(before))
    end
  end
end
