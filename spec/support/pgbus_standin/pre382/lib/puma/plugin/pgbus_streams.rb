# frozen_string_literal: true

# STAND-IN for pgbus's pre-#382 lib/puma/plugin/pgbus_streams.rb: teardown only.
# (Like pgbus's, it registers :after_stopped / :before_restart, which Puma 5.6/6
# never fire — they fire :on_stopped / :on_restart.)
# Like pgbus's, it does not require pgbus: pgbus is loaded only if puma.rb or
# the preloaded app loads it.
require "puma/plugin"

Puma::Plugin.create do
  def start(launcher)
    launcher.events.register(:after_stopped) { teardown_streamer }
    launcher.events.register(:before_restart) { teardown_streamer }
    writer = launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events
    writer.log("[Pgbus::Puma::Plugin] pgbus (pre-#382) pgbus_streams plugin started")
  end

  private

  def teardown_streamer
    Pgbus::Web::Streamer.reset! if defined?(Pgbus::Web::Streamer)
  rescue StandardError => e
    warn("[Pgbus::Puma::Plugin] streamer teardown raised: #{e.class}: #{e.message}")
  end
end
