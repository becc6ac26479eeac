# frozen_string_literal: true

# STAND-IN for pgbus's pre-#382 lib/puma/plugin/pgbus_streams.rb: teardown only.
# (Like pgbus's, it registers :after_stopped / :before_restart, which Puma 5.6/6
# never fire — they fire :on_stopped / :on_restart.)
require "puma/plugin"
require "pgbus"

Puma::Plugin.create do
  def start(launcher)
    launcher.events.register(:after_stopped) { teardown_streamer }
    launcher.events.register(:before_restart) { teardown_streamer }
    Pgbus.logger.info("[Pgbus::Puma::Plugin] pgbus (pre-#382) pgbus_streams plugin started")
  end

  private

  def teardown_streamer
    Pgbus::Web::Streamer.reset! if defined?(Pgbus::Web::Streamer)
  rescue StandardError => e
    Pgbus.logger.warn("[Pgbus::Puma::Plugin] streamer teardown raised: #{e.class}: #{e.message}")
  end
end
