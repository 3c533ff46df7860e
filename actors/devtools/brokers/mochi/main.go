// Mochi MQTT for fxgate's tests and demo (actors/devtools/mochi.py): one TCP listener, anyone
// may connect, the server's shipped capabilities (Receive Maximum 1,024, 8,192 in flight, a 24 h
// maximum message expiry), and its sessions, subscriptions, in-flight and queued messages kept
// in a Pebble store, so that they survive a restart. (Not Mochi's bbolt hook: in v2.7.9 it does
// not store an in-flight message's packet id, and a client whose queued messages were restored
// from it is disconnected at every reconnect with "missing packet id".) Prints
// "fxgate-mochi: started" once it listens; SIGTERM closes it gracefully. Every write to the
// store is synced, so that a SIGKILLed broker loses nothing it acknowledged.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/hooks/storage/pebble"
	"github.com/mochi-mqtt/server/v2/listeners"
)

func main() {
	address := flag.String("address", "127.0.0.1:1883", "host:port to listen on")
	data := flag.String("data", "mochi.db", "the folder of the Pebble store the broker keeps its state in")
	flag.Parse()

	server := mqtt.New(nil)
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		log.Fatal(err)
	}
	if err := server.AddHook(new(pebble.Hook), &pebble.Options{Path: *data, Mode: pebble.Sync}); err != nil {
		log.Fatal(err)
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: *address})
	if err := server.AddListener(tcp); err != nil {
		log.Fatal(err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	if err := server.Serve(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("fxgate-mochi: started")
	<-stop
	if err := server.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("fxgate-mochi: stopped")
}
