package main

import (
	"fmt"
	"io"
	"os"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/shim/config"
)

// prefixed marks every text line as Spillway's: the host's stderr is shared.
type prefixed struct{ logrus.Formatter }

func (p prefixed) Format(e *logrus.Entry) ([]byte, error) {
	b, err := p.Formatter.Format(e)
	return append([]byte("spillway: "), b...), err
}

var levels = map[config.Level]logrus.Level{
	config.LevelError: logrus.ErrorLevel,
	config.LevelWarn:  logrus.WarnLevel,
	config.LevelInfo:  logrus.InfoLevel,
	config.LevelDebug: logrus.DebugLevel,
}

func newLogger(w io.Writer, format config.Format, level config.Level) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	l.SetLevel(levels[level])
	if format == config.FormatJSON {
		l.SetFormatter(&logrus.JSONFormatter{})
	} else {
		l.SetFormatter(prefixed{&logrus.TextFormatter{DisableColors: true, FullTimestamp: true}})
	}
	return l
}

// openLog builds the configured logger. Nothing is written to disk unless
// SPILLWAY_LOG_FILE asks for it.
func openLog(cfg config.Config) (*logrus.Logger, error) {
	var w io.Writer = os.Stderr
	if cfg.LogFile != "" {
		f, err := os.OpenFile(cfg.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel),
				fmt.Errorf("invalid %s=%q: %w (valid example: %s=/tmp/spillway.log)", config.EnvLogFile, cfg.LogFile, err, config.EnvLogFile)
		}
		w = f
	}
	return newLogger(w, cfg.LogFormat, cfg.LogLevel), nil
}
